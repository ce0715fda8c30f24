"""Each node a distinct identity in torch's c10d rendezvous, whatever its address and PID.

torch's dynamic rendezvous names a node by (address, PID, a counter from 0). Two
containers of one job on one host's network (`--network host`, say one per GPU) have the
same address, and each entrypoint has the same PID in its own PID namespace, so both were
`127.0.0.1_7_0`: the rendezvous took them for one node, and in 2 runs of 4 one node timed
out (RendezvousTimeoutError) while the other found the rendezvous closed. Here each
process's counter starts at a random 48-bit number, so two descriptors differ even where
address and PID agree; the descriptor is still torch's own type, compared and ordered as
torch does.
"""

from __future__ import annotations

import secrets


def distinct_node_ids() -> None:
    """Install, once per process, before torch's rendezvous handler is made."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    handler = dr.DynamicRendezvousHandler
    if getattr(handler._node_desc_generator, "distinct", False):
        return
    generator = dr._NodeDescGenerator()
    generator._local_id = secrets.randbits(48)
    generator.distinct = True
    handler._node_desc_generator = generator
