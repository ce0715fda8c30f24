"""disttrain: the in-image API for training code (the image's "unified API").

    import disttrain
    ctx = disttrain.context()            # rank, world size, local rank, dirs, parallel layout
    from disttrain import torch as dt    # init(), device(), wrap_model(), mesh(), shutdown()
    from disttrain import tf as dtf      # strategy(), keras()
    from disttrain import mxnet as dmx   # kvstore(), trainer(), rank(), world_size()
    from disttrain.checkpoint import save, load_latest
    from disttrain.lr import scale_lr, warmup_factor

Code that uses only the frameworks' own APIs (torch.distributed, horovod, TF_CONFIG
strategies, MXNet's kvstore) works in these images too: this module is a convenience, not a
requirement.
"""

from .env import RankInfo, context

__all__ = ["RankInfo", "context"]
