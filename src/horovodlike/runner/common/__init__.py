"""Helpers at the module paths Horovod gives them (horovod.runner.common), for code and tests
written against Horovod that import them by that path."""
