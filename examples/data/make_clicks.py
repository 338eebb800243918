#!/usr/bin/env python3
"""Writes examples/data/clicks_{train,test}.csv: an Avazu-like click log with a known signal.

Columns: id (ignored), click (label), hour (dense, standardized), price (dense, log1p), site,
app, device_type (categorical), tags (multi-value, '|'), interests (weighted, 'tag:weight' ';').
A click is more likely for some sites and apps, for the 'sports' tag, for strong interests and
at evening hours. Deterministic (seeded): python3 examples/data/make_clicks.py
"""
import csv
import math
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
SITES = [f"site{i:02d}.example" for i in range(40)]
APPS = [f"app{i}" for i in range(25)]
DEVICES = ["phone", "tablet", "desktop"]
TAGS = ["news", "sports", "music", "games", "travel", "food", "tech", "fashion"]


def row(rng, i):
    site = rng.choice(SITES[: 5 + rng.randrange(35)])
    app = rng.choice(APPS)
    device = rng.choice(DEVICES)
    hour = rng.randrange(24)
    price = round(rng.lognormvariate(1.0, 1.0), 2)
    tags = rng.sample(TAGS, rng.randrange(0, 4))
    interests = {t: round(rng.random(), 2) for t in rng.sample(TAGS, rng.randrange(0, 3))}
    logit = -1.2
    logit += 0.9 if SITES.index(site) % 4 == 0 else -0.3
    logit += 0.6 if APPS.index(app) % 5 == 1 else 0.0
    logit += 0.7 if "sports" in tags else 0.0
    logit += 1.5 * interests.get("games", 0.0)
    logit += 0.4 if 18 <= hour <= 22 else 0.0
    logit -= 0.15 * math.log1p(price)
    click = 1 if rng.random() < 1 / (1 + math.exp(-logit)) else 0
    return [f"r{i}", click, hour, price, site, app, device, "|".join(tags),
            ";".join(f"{t}:{w}" for t, w in interests.items())]


def write(name, rows, seed, first):
    rng = random.Random(seed)
    with open(os.path.join(HERE, name), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["id", "click", "hour", "price", "site", "app", "device_type", "tags", "interests"])
        for i in range(rows):
            w.writerow(row(rng, first + i))


write("clicks_train.csv", 4000, 1, 0)
write("clicks_test.csv", 1000, 2, 4000)
