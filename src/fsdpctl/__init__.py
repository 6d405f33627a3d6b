"""fsdpctl: typed CLI for PyTorch FSDP Llama-2 training on Amazon EKS and on this machine."""

__version__ = "0.1.0"
