"""The training loop the small examples share: Adam on a regression loss, the
loss printed as it goes, and a check at the end that it fell by half."""

import torch


def fit(forward, params, batch, steps, lr, report_every, seed=1):
    """Trains `params` for `steps` batches. `batch(generator)` returns
    `(x, target)`; `forward(x)` returns the prediction."""
    opt = torch.optim.Adam(params, lr=lr)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        x, target = batch(g)
        opt.zero_grad()
        loss = (forward(x) - target).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % report_every == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}")
    first, last = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    print(f"mean loss of the first 5 steps {first:.4f}, of the last 10 {last:.4f}")
    assert last < 0.5 * first, "the loss should fall"
