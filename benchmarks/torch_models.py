"""PyTorch models for the ``torch_routes`` benchmark, given to the toolkit as factories
(``benchmarks/torch_models.py:small_convnet``). Random weights: the benchmark measures size and speed.
Torchvision-free on purpose (the toolkit does not depend on it)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


class SmallConvNet(nn.Module):
    """Three 3x3 convolutions and a classifier, input 1x3x64x64 (about 94k parameters)."""

    example_input_shapes: ClassVar[dict[str, tuple[int, ...]]] = {"x": (1, 3, 64, 64)}

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
        )
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [
            nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout),
        ]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


class MobileNetLike(nn.Module):
    """A MobileNetV2-shaped net (inverted residuals, depthwise convolutions, ReLU6), width 0.75, input
    1x3x160x160, 1000 classes (about 2.6M parameters)."""

    example_input_shapes: ClassVar[dict[str, tuple[int, ...]]] = {"x": (1, 3, 160, 160)}
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))

    def __init__(self, width: float = 0.75) -> None:
        super().__init__()

        def ch(c: int) -> int:
            return max(8, int(c * width + 4) // 8 * 8)

        cin = ch(32)
        layers: list[nn.Module] = [nn.Conv2d(3, cin, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cin),
                                   nn.ReLU6()]
        for expand, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, ch(c), s if i == 0 else 1, expand))
                cin = ch(c)
        layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


def small_convnet() -> nn.Module:
    torch.manual_seed(0)
    return SmallConvNet().eval()


def mobilenet_like() -> nn.Module:
    torch.manual_seed(0)
    model = MobileNetLike().eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics, as a trained model has
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d) and module.running_mean is not None:
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)  # type: ignore[union-attr]
    return model


class DigitsCNN(nn.Module):
    """The tests' digits CNN (tests/fixtures/torch_models.py: DigitsNet) on 8x8 grey digits, NCHW."""

    example_input_shapes: ClassVar[dict[str, tuple[int, ...]]] = {"x": (1, 1, 8, 8)}

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))


def digits_cnn() -> nn.Module:
    torch.manual_seed(0)
    return DigitsCNN().eval()
