"""Only init() and shutdown(), without a framework: for settings that must fail at init."""

import horovodlike.common.basics as hvd

hvd.init()
print(f"rank {hvd.rank()}: init OK")
hvd.shutdown()
