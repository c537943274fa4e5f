"""The FSDP trainer: ranks and their group (:mod:`.rank`), the model, micro-batches, loss and memory probes."""
