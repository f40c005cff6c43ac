"""A model for `horovodlikerun --plan plan_model:build` (no code runs on import)."""

import torch


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 16))
    return model, torch.randn(8, 16)
