"""Weights pushed from the trainer to the engines after every step: the driver's shell (:mod:`.sync`), the
requests and checks every path shares (:mod:`.calls`), and the paths: disk, distributed, tensor (+ :mod:`.ipc`)."""
