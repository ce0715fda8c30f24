"""Import every framework the image manifest promises; print their versions as JSON."""
import importlib
import json
import os

manifest = json.load(open(os.environ["DISTTRAIN_MANIFEST"]))
modules = {"pytorch": ["torch"], "tensorflow": ["tensorflow"], "keras": ["tf_keras"], "mxnet": ["mxnet"]}
found = {}
for framework in manifest["frameworks"]:
    for name in modules[framework]:
        module = importlib.import_module(name)
        found[name] = getattr(module, "__version__", "?")
for name in ("torchvision", "torchaudio"):
    if name in manifest["versions"]:
        module = importlib.import_module(name)
        found[name] = module.__version__
if "torchvision" in found:
    # Its compiled operators: a torchvision built for another torch fails here.
    import torch
    import torchvision
    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    assert torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8]), 0.5).tolist() == [0]
if manifest.get("horovod"):
    import horovod
    found["horovod"] = horovod.__version__
    for framework in manifest["horovod"]["frameworks"]:
        importlib.import_module({"pytorch": "horovod.torch", "tensorflow": "horovod.tensorflow",
                                 "mxnet": "horovod.mxnet"}[framework])
if "torch_xla" in manifest["versions"]:
    import libtpu
    import torch_xla
    found["torch_xla"] = torch_xla.__version__
    found["libtpu"] = libtpu.__version__
if "mpi4py" in manifest["versions"]:
    import mpi4py
    found["mpi4py"] = mpi4py.__version__
print("VERSIONS " + json.dumps(found, sort_keys=True))
