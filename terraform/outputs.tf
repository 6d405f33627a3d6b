output "cluster_name" {
  description = "Name of the EKS cluster."
  value       = module.eks_gpu.cluster_name
}

output "cluster_endpoint" {
  description = "API server endpoint."
  value       = module.eks_gpu.cluster_endpoint
}

output "cluster_certificate_authority" {
  description = "Base64 CA data for a kubeconfig."
  value       = module.eks_gpu.cluster_certificate_authority
}

output "kubeconfig_command" {
  description = "Writes the kubeconfig for this cluster."
  value       = "aws eks update-kubeconfig --region ${var.region} --name ${module.eks_gpu.cluster_name}"
}

output "gpu_efa_interfaces" {
  description = "EFA interfaces each GPU node has (0: EFA disabled, plain ENA)."
  value       = module.eks_gpu.gpu_efa_interfaces
}

output "fsx_file_system_id" {
  description = "FSX_FILE_SYSTEM_ID for `fsdpctl deploy storage` (null: no file system)."
  value       = module.eks_gpu.fsx_file_system_id
}

output "fsx_dns_name" {
  description = "FSX_DNS_NAME for `fsdpctl deploy storage`."
  value       = module.eks_gpu.fsx_dns_name
}

output "fsx_mount_name" {
  description = "FSX_MOUNT_NAME for `fsdpctl deploy storage`."
  value       = module.eks_gpu.fsx_mount_name
}
