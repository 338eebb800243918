"""A dense model of one's own, written in PyTorch and trained by hyrec (model.kind: torchscript).

The model is DCN-like with a user/item split: a cross network and a deep MLP over the dense
features and every pooled embedding, plus the dot product of a user tower (the device and the
interests) and an item tower (the site, the app and the tags). hyrec calls

    forward(dense: Tensor, pooled: List[Tensor]) -> Tensor

with dense [B, num_dense] and one pooled embedding [B, dim] per slot, in the job's slot order,
and trains the module's parameters on its dense workers while the embeddings live on its PS.

This script scripts the module (torch.jit.script), saves it and writes a job for the click data in
examples/data. From the project root:

    python3 examples/python_model/model.py --out=python-model
    build/hyrec train --config=python-model/job.yaml
    build/hyrec eval --model=python-model/export --input=examples/data/clicks_test.csv

It needs the PyTorch that matches hyrec's LibTorch: Debian's python3-torch for libtorch-dev.
"""
import argparse
import os
from typing import List

import torch
from torch import Tensor, nn

# The job's features, in slot order, with their embedding dims (the tables below); the model is
# built for exactly these, and hyrec checks the module against the job before it trains.
SLOTS = [("site", 8), ("app", 8), ("device_type", 4), ("tags", 8), ("interests", 8)]
USER_SLOTS = ["device_type", "interests"]
NUM_DENSE = 2  # hour and price


class ClickModel(nn.Module):
    def __init__(self, num_dense: int, slot_dims: List[int], user_slots: List[int], cross_layers: int = 2,
                 hidden: int = 32, tower: int = 8, dropout: float = 0.1):
        super().__init__()
        width = num_dense + sum(slot_dims)
        self.user_slots = user_slots
        self.item_slots = [i for i in range(len(slot_dims)) if i not in user_slots]
        self.cross = nn.ModuleList([nn.Linear(width, width) for _ in range(cross_layers)])
        self.deep = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, hidden),
                                  nn.ReLU())
        self.user_tower = nn.Linear(sum(slot_dims[i] for i in user_slots), tower)
        self.item_tower = nn.Linear(sum(slot_dims[i] for i in self.item_slots), tower)
        self.head = nn.Linear(width + hidden, 1)

    def forward(self, dense: Tensor, pooled: List[Tensor]) -> Tensor:
        x0 = torch.cat([dense] + pooled, dim=1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        user: List[Tensor] = []
        for i in self.user_slots:
            user.append(pooled[i])
        item: List[Tensor] = []
        for i in self.item_slots:
            item.append(pooled[i])
        affinity = (self.user_tower(torch.cat(user, dim=1)) * self.item_tower(torch.cat(item, dim=1))).sum(1)
        return self.head(torch.cat([x, self.deep(x0)], dim=1)).squeeze(1) + affinity


JOB = """# Written by examples/python_model/model.py: the click data of examples/data with a model of
# one's own (model.kind: torchscript).
loader:
  source:
    format: csv
    files: [{data}/clicks_train.csv]
    csv:
      header: true
      columns:
        - {{name: id, type: ignore}}
        - {{name: click, type: label, positives: ["1"], negatives: ["0"]}}
        - {{name: hour, type: dense, transform: standardize, mean: 11.5, stddev: 6.9}}
        - {{name: price, type: dense, transform: log1p}}
        - {{name: site, type: categorical}}
        - {{name: app, type: categorical}}
        - {{name: device_type, type: categorical}}
        - {{name: tags, type: multi, separator: "|"}}
        - {{name: interests, type: weighted, separator: ";", weight_separator: ":"}}
  batch_size: 128
  threads: 1
  epochs: {epochs}
  shuffle_window: 4096
eval:
  files: [{data}/clicks_test.csv]
tables:
{tables}
model:
  kind: torchscript
  path: {module}
ps:
  shards: 2
  optimizer: adagrad
  learning_rate: 0.05
train:
  dense_optimizer: adam
  dense_learning_rate: 0.003
  log_every_batches: 20
checkpoint:
  dir: {out}/checkpoints
  every_steps: 50
export:
  dir: {out}/export
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="python-model", help="where module.pt and job.yaml go")
    parser.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"),
                        help="the directory of clicks_train.csv and clicks_test.csv")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    names = [name for name, _ in SLOTS]
    model = ClickModel(NUM_DENSE, [dim for _, dim in SLOTS], [names.index(n) for n in USER_SLOTS])
    module = os.path.join(out, "module.pt")
    torch.jit.save(torch.jit.script(model), module)
    tables = "\n".join("  - {{name: {0}, features: [{0}], dim: {1}}}".format(name, dim) for name, dim in SLOTS)
    with open(os.path.join(out, "job.yaml"), "w") as f:
        f.write(JOB.format(data=os.path.abspath(args.data), tables=tables, module=module, out=out, epochs=args.epochs))
    print("wrote {} and {}".format(module, os.path.join(out, "job.yaml")))


if __name__ == "__main__":
    main()
