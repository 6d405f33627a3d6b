variable "cluster_name" {
  description = "EKS cluster name."
  type        = string
}

variable "kubernetes_version" {
  description = "EKS Kubernetes version."
  type        = string
}

variable "availability_zones" {
  description = "AZs for the subnets (two or more); the GPU nodes use the first."
  type        = list(string)
}

variable "vpc_cidr" {
  description = "VPC CIDR (of the VPC made here)."
  type        = string
}

variable "vpc_id" {
  description = "An existing VPC to use instead of making one; empty: make one."
  type        = string
  default     = ""
}

variable "private_subnet_ids" {
  description = "With vpc_id: its private subnets for the cluster and the nodes; the GPU nodes use the first."
  type        = list(string)
  default     = []
}

variable "instance_type" {
  description = "GPU instance type."
  type        = string
}

variable "node_count" {
  description = "GPU nodes."
  type        = number
}

variable "capacity_reservation_id" {
  description = "Capacity reservation for the GPU nodes, or empty."
  type        = string
  default     = ""
}

variable "capacity_block" {
  description = "capacity_reservation_id is a Capacity Block for ML (launched with market type capacity-block)."
  type        = bool
  default     = false
}

variable "efa_interfaces" {
  description = "EFA interfaces per GPU node (0: none, plain ENA)."
  type        = number
}

variable "system_instance_type" {
  description = "System node group instance type."
  type        = string
}

variable "system_volume_size" {
  description = "System node root volume, GiB."
  type        = number
}

variable "gpu_volume_size" {
  description = "GPU node root volume, GiB."
  type        = number
}

variable "endpoint_public_access" {
  description = "Kubernetes API reachable from outside the VPC."
  type        = bool
}

variable "public_access_cidrs" {
  description = "CIDRs allowed to the public Kubernetes API endpoint."
  type        = list(string)
}

variable "cluster_log_types" {
  description = "EKS control plane logs sent to CloudWatch."
  type        = list(string)
}

variable "fsx_storage_gib" {
  description = "FSx for Lustre file system size in GiB (PERSISTENT_2: 1200 or a multiple of 2400); 0: none."
  type        = number
}

variable "fsx_throughput" {
  description = "FSx for Lustre PERSISTENT_2 throughput, MB/s per TiB: 125, 250, 500 or 1000."
  type        = number
}
