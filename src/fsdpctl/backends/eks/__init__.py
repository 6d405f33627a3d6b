"""BACKEND=eks: the job as a PyTorchJob or TrainJob on the cluster of the kubeconfig."""
