"""The contract: what a user may tell the image, and what the image carries. Pure.

    config.py      every variable (VARIABLES), parsed and checked in one place, with its one-line errors
    spelling.py    set variables that look like VARIABLES but are not one (FRAMWORK, NUM_NODE)
    schedulers.py  other schedulers' variables (Kubeflow, Slurm, mpirun, TFJob, SageMaker...) -> this contract
    arguments.py   the arguments after the image name: a command, or the script's arguments
    manifest.py    what this image carries (/etc/disttrain/manifest.json)
    reference.py   docs/configuration.md's table, generated from VARIABLES

Nothing here starts, opens or watches anything; every other room builds on it.
"""
