"""The main job's model and data, as the C++ library has them (torch/models.h, data/fashion_mnist.h):
Caffe's LeNet and Fashion-MNIST from Debian's dataset-fashion-mnist, with the same normalization and the
same per-epoch sharding rule (a strided shard of one permutation, padded so every rank takes as many)."""

import gzip
import os
import struct

import torch
import torch.nn.functional as F

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's, as data/fashion_mnist.h has them


class LeNet(torch.nn.Module):
    """Caffe's LeNet: conv 20@5x5, max-pool, conv 50@5x5, max-pool, ip1 500, ReLU, ip2 10 (431,080 parameters)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 20, 5)
        self.conv2 = torch.nn.Conv2d(20, 50, 5)
        self.ip1 = torch.nn.Linear(800, 500)
        self.ip2 = torch.nn.Linear(500, 10)

    def forward(self, x):
        return self.classify(self.features(x))

    def features(self, x):
        """The conv part, to the flattened pooled map (rows x 800)."""
        x = F.max_pool2d(self.conv1(x), 2)
        return F.max_pool2d(self.conv2(x), 2).flatten(1)

    def classify(self, h):
        """The FC part: ip1, ReLU, ip2."""
        return self.ip2(F.relu(self.ip1(h)))

    def merged_fc(self):
        """The split for DistributedModel(..., merged_fc=): (features, a module holding ip1 and ip2)."""
        return self.features, LeNetClassifier(self)


class LeNetClassifier(torch.nn.Module):
    """LeNet's FC layers as a module of their own (the same parameters, not a copy), for merged FC."""

    def __init__(self, net):
        super().__init__()
        self.ip1, self.ip2 = net.ip1, net.ip2

    def forward(self, h):
        return self.ip2(F.relu(self.ip1(h)))


def fashion_mnist(kind, directory=FASHION_MNIST):
    """Images (N, 1, 28, 28), normalized, and labels (N,) of the "train" or "test" set."""
    prefix = {"train": "train", "test": "t10k"}[kind]
    images = os.path.join(directory, prefix + "-images-idx3-ubyte.gz")
    if not os.path.exists(images):
        raise FileNotFoundError("%s is missing: apt-get install dataset-fashion-mnist" % images)
    with gzip.open(images, "rb") as f:
        magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
        if magic != 2051:
            raise ValueError("%s is not an IDX image file" % images)
        pixels = torch.frombuffer(bytearray(f.read(n * rows * cols)), dtype=torch.uint8)
    labels_path = os.path.join(directory, prefix + "-labels-idx1-ubyte.gz")
    with gzip.open(labels_path, "rb") as f:
        magic, m = struct.unpack(">II", f.read(8))
        if magic != 2049 or m != n:
            raise ValueError("%s does not match its %d images" % (labels_path, n))
        labels = torch.frombuffer(bytearray(f.read(m)), dtype=torch.uint8).long()
    return ((pixels.float().div(255.0) - MEAN) / STD).view(n, 1, rows, cols), labels


def shard(count, world, rank, seed, epoch):
    """This rank's sample indices for an epoch."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed + epoch))
    per_rank = (count + world - 1) // world
    return order[(rank + torch.arange(per_rank) * world) % count]
