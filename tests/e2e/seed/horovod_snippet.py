"""The Horovod snippet from the PyTorch-CUDA description (seed 001), completed into a loop.

The seed's lines are kept in its order; what it leaves undefined or out is marked
`# completed:`. The data is synthetic (2048 MNIST-shaped samples, labels from a fixed
linear map). Prints the RESULT line the container tests read (testing/results.py).
"""

import hashlib

import torch
import torch.nn as nn
import torch.optim as optim
import horovod.torch as hvd
from torch.utils.data import DataLoader, TensorDataset                         # completed
from torch.utils.data.distributed import DistributedSampler

# 初始化 Horovod
hvd.init()
# 设置 GPU 设备绑定
if torch.cuda.is_available():                                                  # completed: also on CPU
    torch.cuda.set_device(hvd.local_rank())
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")          # completed
generator = torch.Generator().manual_seed(1234)                                 # completed: the data
inputs = torch.randn(2048, 784, generator=generator)
labels = (inputs @ torch.randn(784, 10, generator=generator)).argmax(dim=1)
dataset = TensorDataset(inputs, labels)
# 构建模型并移动到对应设备
model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
# 包装优化器，自动处理梯度同步
optimizer = optim.Adam(model.parameters(), lr=0.001 * hvd.size())  # 学习率随规模缩放
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
# 广播初始参数（确保所有rank起点一致）
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
# 数据采样器自动切分数据集
train_sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
train_loader = DataLoader(dataset, batch_size=64, sampler=train_sampler)

# completed: the training loop, and the loss on all the data before and after it
loss_fn = nn.CrossEntropyLoss()


def full_loss() -> float:
    with torch.no_grad():
        return loss_fn(model(inputs.to(device)), labels.to(device)).item()


before = full_loss()
for epoch in range(3):
    train_sampler.set_epoch(epoch)
    for data, target in train_loader:
        optimizer.zero_grad()
        loss = loss_fn(model(data.to(device)), target.to(device))
        loss.backward()
        optimizer.step()
after = full_loss()
digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
print(f"RESULT framework=pytorch rank={hvd.rank()} world={hvd.size()} loss_before={before:.6f} "
      f"loss_after={after:.6f} digest={digest}", flush=True)
