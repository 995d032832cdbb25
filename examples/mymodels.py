# mymodels.py: your own model, in a module beside your script (docs/api.md "Plan for your own model")
import torch
from torch import nn


class SmallNet(nn.Module):
    """Any nn.Module torch.fx can trace; here a 3-block CNN for 3x32x32 images (cifar10-subset)."""

    def __init__(self, num_classes: int = 10) -> None:   # adaptplan calls SmallNet(num_classes=M)
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.conv2 = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 8 * 8, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv2(self.conv1(x)))
