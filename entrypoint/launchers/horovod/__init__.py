"""Horovod, without SSH or horovodrun.

    fixed.py              HorovodGloo and HorovodMpi: a fixed-size job, and the slots' variables
    rendezvous_server.py  Horovod's own HTTP rendezvous server, on a fixed port
    elastic.py            HorovodElastic: hvd.elastic with MIN_NODES/MAX_NODES
    elastic_driver.py     Horovod's ElasticDriver on the master, fed by the job store, and each node's side
"""
