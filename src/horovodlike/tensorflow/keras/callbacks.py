"""Keras 3 callbacks (the same as horovodlike.keras.callbacks)."""

from horovodlike.keras.callbacks import (BroadcastGlobalVariablesCallback,  # noqa: F401
                                         MetricAverageCallback, LearningRateScheduleCallback,
                                         LearningRateWarmupCallback)
