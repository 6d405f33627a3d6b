# Root: an EKS cluster with a system node group and an EFA-enabled GPU node group, from ./modules/eks-gpu.
# Self-contained (no registry modules). fsdpctl writes fsdpctl.auto.tfvars.json from its settings.
module "eks_gpu" {
  source = "./modules/eks-gpu"

  cluster_name            = var.cluster_name
  kubernetes_version      = var.kubernetes_version
  availability_zones      = var.availability_zones
  vpc_cidr                = var.vpc_cidr
  vpc_id                  = var.vpc_id
  private_subnet_ids      = var.private_subnet_ids
  instance_type           = var.instance_type
  node_count              = var.node_count
  capacity_reservation_id = var.capacity_reservation_id
  capacity_block          = var.capacity_reservation_id != "" && var.capacity_reservation_type == "capacity-block"
  efa_interfaces          = var.efa_enabled ? var.efa_interfaces : 0
  system_instance_type    = var.system_instance_type
  system_volume_size      = var.system_volume_size
  gpu_volume_size         = var.gpu_volume_size
  endpoint_public_access  = var.endpoint_public_access
  public_access_cidrs     = var.public_access_cidrs
  cluster_log_types       = var.cluster_log_types
  fsx_storage_gib         = var.fsx_storage_gib
  fsx_throughput          = var.fsx_throughput
}
