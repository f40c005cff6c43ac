"""Horovod's horovod.runner.common.util helpers that code written for Horovod imports."""
