"""cellc.nn.LSTM under DistributedDataParallel: two processes on this machine
(the gloo backend), each training on its half of every batch.

    python3 examples/ddp_lstm.py

DDP averages the gradients over the processes, so each step equals one
process training on the whole batch; the script checks that on its last step.
"""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import cellc

WORLD, T, B, I, H, STEPS = 2, 12, 8, 3, 16, 5


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = cellc.nn.LSTM(I, H, num_layers=2, recompute="full")
        self.head = torch.nn.Linear(H, 1)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out)


def batches():
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(T, B, I, generator=g)
        yield x, x[..., :1].cumsum(0) * 0.1


def loss_of(model, x, y):
    return (model(x) - y).pow(2).mean()


def worker(rank, init_file, out_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD)
    ddp = torch.nn.parallel.DistributedDataParallel(Model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    rows = slice(rank * B // WORLD, (rank + 1) * B // WORLD)
    for step, (x, y) in enumerate(batches()):
        opt.zero_grad()
        loss = loss_of(ddp, x[:, rows], y[:, rows])
        loss.backward()
        if step == STEPS - 1 and rank == 0:
            torch.save([p.grad for p in ddp.parameters()], out_file)
        opt.step()
        if rank == 0:
            print(f"step {step}  loss on rank 0's half {loss.item():.4f}")
    dist.destroy_process_group()


def single_process_grads():
    model = Model()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    for step, (x, y) in enumerate(batches()):
        opt.zero_grad()
        loss_of(model, x, y).backward()
        if step == STEPS - 1:
            return [p.grad.clone() for p in params]
        opt.step()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        init_file, out_file = os.path.join(tmp, "init"), os.path.join(tmp, "grads.pt")
        mp.spawn(worker, args=(init_file, out_file), nprocs=WORLD, join=True)
        ddp_grads = torch.load(out_file)
    worst = max((a - b).abs().max().item()
                for a, b in zip(ddp_grads, single_process_grads()))
    print(f"largest difference between DDP's gradients and one process's: {worst:.2e}")
    assert worst < 1e-5


if __name__ == "__main__":
    main()
