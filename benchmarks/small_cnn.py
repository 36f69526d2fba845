"""A 0.49 M-parameter CNN (three 3x3 stride-2 convolutions, two dense layers; input 1x1x32x32, ten outputs) for
the ``fail_fast`` benchmark: the size of issue 34's pitch CNN. Random weights (seed 0): for timing only."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


class SmallCNN(nn.Module):
    example_input_shapes: ClassVar[dict[str, tuple[int, ...]]] = {"x": (1, 1, 32, 32)}

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(128 * 4 * 4, 192), nn.ReLU(), nn.Linear(192, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def small_cnn() -> SmallCNN:
    torch.manual_seed(0)
    return SmallCNN().eval()
