"""Gradient synchronization strategies, applied inside the training process with no change
to the script: GRAD_COMPRESSION, GRAD_ACCUMULATION, GRAD_BUCKET_MB (the entrypoint checked
them against the framework and passed them to every rank; entrypoint/contract/grad_sync.py
holds what each framework honours).

The image's per-interpreter line (disttrain.pth) calls `install()` in every Python process;
with the defaults it does nothing. Else it patches, as each is imported:

  PyTorch DDP (`DistributedDataParallel(model)`, also what disttrain.torch.wrap_model makes):
    GRAD_BUCKET_MB is its `bucket_cap_mb` unless the script passes one; at its first forward
    pass, unless the script registered a communication hook of its own, the compression's
    hook: torch's fp16_compress_hook, bf16_compress_hook (on Gloo, past DDP's check for
    NCCL: bf16_compress_hook_on_gloo) or powerSGD_hook. With
    GRAD_ACCUMULATION=N, all but every Nth training forward pass run as under `no_sync()`.
  Horovod (`hvd.DistributedOptimizer(opt)` for PyTorch, TensorFlow and Keras, and
    `hvd.DistributedGradientTape`): compression=hvd.Compression.fp16, and for PyTorch and
    Keras backward_passes_per_step=N (Keras: with average_aggregated_gradients), unless the
    script passes them. GRAD_BUCKET_MB reaches Horovod as HOROVOD_FUSION_THRESHOLD (the
    entrypoint sets it).
  Every torch optimizer, with GRAD_ACCUMULATION=N: `step()` applies once every N calls,
    `zero_grad()` only after an applied step, and each parameter's gradient is scaled by
    1/N as it arrives, so that the update is one step on the mean over the N micro-batches:
    with equal micro-batches, the step on their combined batch. AMP's GradScaler
    (unscale_, step, update) and gradient clipping (clip_grad_norm_, clip_grad_value_)
    wait for the applied step too: they see the whole sum, once.

Each process that applies something says so once (rank 0 only): `disttrain: gradients: ...`.
"""

from __future__ import annotations

import inspect
import os
import sys
import types
import weakref

from .gradsync_settings import GradSync
from .hooks import after_import

DDP_MODULE = "torch.nn.parallel.distributed"
OPTIMIZER_MODULE = "torch.optim.optimizer"


_said: set[str] = set()


def _say(what: str) -> None:
    """One line per thing applied, from the job's first rank."""
    if what in _said or os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")) not in ("0", ""):
        return
    _said.add(what)
    sys.stderr.write(f"disttrain: gradients: {what}\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------- DDP

def _comm_hook(settings: GradSync, gloo: bool):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if settings.compression == "fp16":
        return None, default_hooks.fp16_compress_hook
    if settings.compression == "bf16":
        return None, bf16_compress_hook_on_gloo if gloo else default_hooks.bf16_compress_hook
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=settings.powersgd_rank,
                                        start_powerSGD_iter=settings.powersgd_warmup)
    _narrow_products_on_cpu(powerSGD_hook)
    return state, _one_chain_at_a_time_on_cpu(powerSGD_hook.powerSGD_hook)


def _narrow_products_on_cpu(module) -> None:
    """powerSGD_hook computes each P as M·Q and each Q as Mᵀ·P, `torch.bmm` with a right side
    a few columns wide (the rank). On CPU, MKL runs those products several times slower than
    the same numbers as (Qᵀ·Mᵀ)ᵀ and (Pᵀ·M)ᵀ (docs/gradient-sync.md: a 4096x4096 gradient at
    rank 4, one thread, 21 and 106 ms against 8 and 10 ms; a PowerSGD step of the 25M-
    parameter benchmark on one thread went from 0.38 to 0.21 s). The hook's module gets a
    `torch` whose `bmm` takes that route for a CPU product with a narrow right side;
    everything else is torch's own."""
    if not isinstance(module.torch, _TorchWithNarrowProducts):
        module.torch = _TorchWithNarrowProducts(module.torch)


class _TorchWithNarrowProducts(types.ModuleType):
    """torch, but bmm(a, b, out=...) on CPU with `b` at most an eighth as wide as `a` is tall
    is (bᵀ·aᵀ)ᵀ, copied into out."""

    def __init__(self, torch):
        super().__init__("torch")
        self._torch = torch

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def bmm(self, input, mat2, *, out=None):
        if out is not None and not input.is_cuda and input.dim() == 3 and mat2.shape[2] * 8 <= input.shape[1]:
            return out.copy_(self._torch.bmm(mat2.transpose(1, 2), input.transpose(1, 2)).transpose(1, 2))
        return self._torch.bmm(input, mat2, out=out)


def bf16_compress_hook_on_gloo(process_group, bucket):
    """torch's bf16_compress_hook, for a Gloo process group. DDP's register_comm_hook refuses
    that hook by its name unless CUDA with NCCL 2.10+ (or XPU) is there, for NCCL's sake;
    Gloo's all-reduce has summed bfloat16 for as long as the matrix's torch versions."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return default_hooks.bf16_compress_hook(process_group, bucket)


def _one_chain_at_a_time_on_cpu(hook):
    """powerSGD_hook waits for its second and third all-reduce inside the callbacks of the
    first, and on CPU tensors those callbacks run on Gloo's own worker threads (two per
    process group): two buckets' chains in flight block both threads and the job hangs
    (seen with a 25M-parameter model, and with two 1 MB buckets). On CPU, each bucket's
    chain therefore ends before the next bucket's hook returns. CUDA buckets (NCCL, whose
    futures complete on the stream, the path upstream tests) keep overlapping."""
    import functools

    @functools.wraps(hook)
    def hook_(state, bucket):
        future = hook(state, bucket)
        if not bucket.buffer().is_cuda:
            future.wait()
        return future
    return hook_


def _patch_ddp(module, settings: GradSync) -> None:
    ddp = module.DistributedDataParallel
    init, forward = ddp.__init__, ddp.forward
    bucket_param = inspect.signature(init).parameters.get("bucket_cap_mb")

    def __init__(self, *args, **kwargs):
        if settings.bucket_mb is not None and bucket_param is not None:
            given = inspect.signature(init).bind_partial(self, *args, **kwargs).arguments
            if given.get("bucket_cap_mb") is None and not given.get("bucket_cap_mb_list"):
                kwargs["bucket_cap_mb"] = settings.bucket_mb
                _say(f"{settings.bucket_mb} MB buckets (DDP bucket_cap_mb)")
        init(self, *args, **kwargs)
        self._disttrain_micro_batches = 0
        self._disttrain_hooked = False

    def forward_(self, *args, **kwargs):
        if not self._disttrain_hooked:
            self._disttrain_hooked = True
            if settings.compression != "none":
                if self._comm_hooks:
                    _say(f"GRAD_COMPRESSION={settings.compression} not applied: the script registered "
                         f"its own communication hook ({self._comm_hooks[0][0].__name__})")
                else:
                    gloo = module.dist.get_backend(self.process_group) == "gloo"
                    state, hook = _comm_hook(settings, gloo)
                    self.register_comm_hook(state, hook)
                    _say(f"{settings.compression} compression (DDP comm hook {hook.__name__})")
        if settings.accumulation > 1 and self.training and module.torch.is_grad_enabled():
            self.require_backward_grad_sync = (
                self._disttrain_micro_batches % settings.accumulation == settings.accumulation - 1)
            self._disttrain_micro_batches += 1
        return forward(self, *args, **kwargs)

    __init__.__doc__, forward_.__doc__ = init.__doc__, forward.__doc__
    ddp.__init__, ddp.forward = __init__, forward_


# --------------------------------------------------------------------------- optimizers

def _scale_gradients(parameters, n: int) -> None:
    """Each incoming gradient times 1/n, before it is accumulated into .grad (and so before
    DDP's and Horovod's hooks, which run after accumulation, send it)."""
    for p in parameters:
        if p.requires_grad and not getattr(p, "_disttrain_scaled", False):
            p.register_hook(lambda grad, n=n: grad / n)
            p._disttrain_scaled = True


_gated: "weakref.WeakSet" = weakref.WeakSet()         # the optimizers that step every N calls


def _applies_next(optimizer) -> bool:
    """Whether this optimizer's next step() call is one that applies (ends its N micro-batches)."""
    n = _installed[0].accumulation
    return (optimizer._disttrain_calls + 1) % n == 0


def _mid_window() -> bool:
    """Between micro-batches: no gated optimizer's next step applies."""
    optimizers = list(_gated)
    return bool(optimizers) and not any(_applies_next(o) for o in optimizers)


def _patch_optimizer(module, settings: GradSync) -> None:
    optimizer = module.Optimizer
    init = optimizer.__init__
    n = settings.accumulation

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if getattr(self, "_disttrain_calls", None) is not None:
            return
        self._disttrain_calls = 0
        step, zero_grad = self.step, self.zero_grad

        def gated_step(this, *a, **k):
            this._disttrain_calls += 1
            if this._disttrain_calls % n:
                return None                       # a micro-batch: its gradients only accumulate
            return step(*a, **k)

        def gated_zero_grad(this, *a, **k):
            if this._disttrain_calls % n:
                return None                       # between micro-batches: keep what accumulated
            return zero_grad(*a, **k)

        self.step = types.MethodType(gated_step, self)
        self.zero_grad = types.MethodType(gated_zero_grad, self)
        _gated.add(self)
        for group in self.param_groups:
            _scale_gradients(group["params"], n)
        _say(f"accumulation of {n} micro-batches per step (the optimizer steps every {n} calls)")

    __init__.__doc__ = init.__doc__
    optimizer.__init__ = __init__


def _patch_grad_scaler(module, settings: GradSync) -> None:
    """AMP's GradScaler with accumulation: between micro-batches the gradients stay scaled
    (unscale_ waits), step() only counts, and the scale changes only after an applied step,
    so the N scaled micro-batches are unscaled once, checked once for inf/NaN, and applied."""
    scaler = module.GradScaler
    unscale_, step, update = scaler.unscale_, scaler.step, scaler.update

    def gated(optimizer) -> bool:
        return optimizer in _gated and not _applies_next(optimizer)

    def unscale(self, optimizer):
        if gated(optimizer):
            return None
        return unscale_(self, optimizer)

    def step_(self, optimizer, *args, **kwargs):
        self._disttrain_counted = gated(optimizer)
        if self._disttrain_counted:
            return optimizer.step()                  # counts the micro-batch; applies nothing
        return step(self, optimizer, *args, **kwargs)

    def update_(self, new_scale=None):
        if getattr(self, "_disttrain_counted", False) and new_scale is None:
            return None
        return update(self, new_scale)

    for name, original, new in (("unscale_", unscale_, unscale), ("step", step, step_), ("update", update, update_)):
        new.__doc__, new.__name__ = original.__doc__, original.__name__
        setattr(scaler, name, new)


def _patch_clipping(module, settings: GradSync) -> None:
    """Gradient clipping with accumulation: between micro-batches the gradients are a
    partial sum, so clipping waits for the applied step (the norm is still returned)."""
    norm_, value_ = module.clip_grad_norm_, module.clip_grad_value_

    def clip_grad_norm_(parameters, max_norm, *args, **kwargs):
        return norm_(parameters, float("inf") if _mid_window() else max_norm, *args, **kwargs)

    def clip_grad_value_(parameters, clip_value, *args, **kwargs):
        if _mid_window():
            return None
        return value_(parameters, clip_value, *args, **kwargs)

    for new, original in ((clip_grad_norm_, norm_), (clip_grad_value_, value_)):
        new.__doc__, new.__name__ = original.__doc__, original.__name__
        setattr(module, original.__name__, new)


# --------------------------------------------------------------------------- Horovod

def _with_defaults(module, name: str, defaults: dict, said: dict) -> None:
    """module.name(...) with `defaults` for the keywords the caller left at the function's own
    default. Horovod's own examples pass `compression=hvd.Compression.none` explicitly: that
    is no choice, and the job's setting applies; a script's other value is kept, and said."""
    original = getattr(module, name)
    signature = inspect.signature(original)

    def wrapper(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs)
        for key, value in defaults.items():
            if key not in signature.parameters:
                continue
            default = signature.parameters[key].default
            if key in bound.arguments and not (bound.arguments[key] is default or bound.arguments[key] == default):
                if key in said and bound.arguments[key] != value:
                    chosen = getattr(bound.arguments[key], "__name__", bound.arguments[key])
                    _say(f"{said[key]} not applied: the script passes {key}={chosen}")
                continue
            bound.arguments[key] = value
            if key in said:
                _say(said[key])
        return original(*bound.args, **bound.kwargs)

    wrapper.__doc__, wrapper.__name__, wrapper.__signature__ = original.__doc__, original.__name__, signature
    setattr(module, name, wrapper)


def _horovod_defaults(settings: GradSync, compression_module: str, keras: bool = False) -> tuple[dict, dict]:
    defaults, said = {}, {}
    if settings.compression == "fp16":
        import importlib
        defaults["compression"] = importlib.import_module(compression_module).Compression.fp16
        said["compression"] = "fp16 compression (hvd.Compression.fp16)"
    if settings.accumulation > 1:
        defaults["backward_passes_per_step"] = settings.accumulation
        said["backward_passes_per_step"] = (f"accumulation of {settings.accumulation} batches per synchronization "
                                            f"(backward_passes_per_step)")
        if keras:
            defaults["average_aggregated_gradients"] = True
    return defaults, said


def _patch_horovod_torch(module, settings: GradSync) -> None:
    _with_defaults(module, "DistributedOptimizer", *_horovod_defaults(settings, "horovod.torch.compression"))


def _patch_horovod_tensorflow(module, settings: GradSync) -> None:
    defaults, said = _horovod_defaults(settings, "horovod.tensorflow.compression")
    for name in ("DistributedOptimizer", "DistributedGradientTape"):
        _with_defaults(module, name, defaults, said)


def _patch_horovod_keras(module, settings: GradSync) -> None:
    _with_defaults(module, "DistributedOptimizer",
                   *_horovod_defaults(settings, "horovod.tensorflow.compression", keras=True))


_installed: list[GradSync] = []


def install(env=None) -> None:
    """Patch what the job's settings need, once per process (a second call does nothing)."""
    if _installed:
        return
    try:
        settings = GradSync.from_env(os.environ if env is None else env)
    except ValueError as exc:            # a process the entrypoint did not start (it checks them)
        if str(exc) not in _said:
            _said.add(str(exc))
            sys.stderr.write(f"disttrain: gradients: {exc}; nothing applied\n")
        return
    if settings.default:
        return
    _installed.append(settings)
    after_import(DDP_MODULE, lambda m: _patch_ddp(m, settings))
    if settings.accumulation > 1:
        after_import(OPTIMIZER_MODULE, lambda m: _patch_optimizer(m, settings))
        after_import("torch.amp.grad_scaler", lambda m: _patch_grad_scaler(m, settings))
        after_import("torch.nn.utils.clip_grad", lambda m: _patch_clipping(m, settings))
    after_import("horovod.torch.optimizer", lambda m: _patch_horovod_torch(m, settings))
    after_import("horovod.tensorflow", lambda m: _patch_horovod_tensorflow(m, settings))
    for keras in ("horovod.tensorflow.keras", "horovod.keras"):
        after_import(keras, lambda m: _patch_horovod_keras(m, settings))
