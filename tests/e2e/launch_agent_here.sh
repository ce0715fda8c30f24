#!/bin/sh
# Open MPI's launch agent (plm_rsh_agent) for two "hosts" on one machine: where ssh would log
# in to the host it is given and run the command there, this runs it here. Each node's
# entrypoint has its own loopback address (NODE_ADDR=127.0.0.k), which Open MPI does not
# count as this host, so mpirun starts its daemon for that node through this agent.
while [ "$#" -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
shift                    # the host
exec sh -c "$*"
