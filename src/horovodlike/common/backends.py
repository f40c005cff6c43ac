"""The CPU backends' names, as the core spells them (csrc/common/backend_names.h;
tests/test_settings.py checks that the core accepts exactly these): one list for the launcher's
settings and the Python API alike."""

TRANSPORTS = ("tcp", "mpi", "gloo")
TCP, MPI, GLOO = TRANSPORTS
