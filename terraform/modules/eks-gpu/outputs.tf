output "cluster_name" {
  description = "Name of the EKS cluster."
  value       = aws_eks_cluster.this.name
}

output "cluster_endpoint" {
  description = "API server endpoint."
  value       = aws_eks_cluster.this.endpoint
}

output "cluster_certificate_authority" {
  description = "Base64 CA data."
  value       = aws_eks_cluster.this.certificate_authority[0].data
}

output "gpu_efa_interfaces" {
  description = "EFA interfaces the launch template gives each GPU node."
  value       = length(aws_launch_template.gpu.network_interfaces)
}

output "fsx_file_system_id" {
  description = "The shared FSx for Lustre file system ('' when none)."
  value       = one(aws_fsx_lustre_file_system.shared[*].id)
}

output "fsx_dns_name" {
  description = "Its DNS name."
  value       = one(aws_fsx_lustre_file_system.shared[*].dns_name)
}

output "fsx_mount_name" {
  description = "Its Lustre mount name."
  value       = one(aws_fsx_lustre_file_system.shared[*].mount_name)
}
