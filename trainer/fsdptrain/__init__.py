"""fsdptrain: the FSDP2 Llama training program that fsdpctl launches (see fsdptrain.train)."""

__version__ = "0.1.0"
