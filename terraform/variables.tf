variable "region" {
  description = "AWS region of the cluster."
  type        = string
  default     = "us-west-2"
}

variable "cluster_name" {
  description = "EKS cluster name."
  type        = string
  default     = "fsdp-eks"
}

variable "kubernetes_version" {
  description = "EKS Kubernetes version."
  type        = string
  default     = "1.33"
}

variable "availability_zones" {
  description = "Two or more AZs for the subnets; the GPU node group and its placement group use the first."
  type        = list(string)
  default     = ["us-west-2a", "us-west-2b"]
}

variable "vpc_cidr" {
  description = "CIDR of the VPC the module creates."
  type        = string
  default     = "10.42.0.0/16"
}

variable "vpc_id" {
  description = "An existing VPC (vpc-...) for the cluster instead of the one made from vpc_cidr; empty: make one."
  type        = string
  default     = ""
}

variable "private_subnet_ids" {
  description = "With vpc_id: its private subnets (two or more, in different AZs, with a route out through a NAT gateway or endpoints); the GPU node group and the FSx file system use the first."
  type        = list(string)
  default     = []
}

variable "instance_type" {
  description = "GPU node type: one fsdpctl knows (INSTANCE_TYPES in src/fsdpctl/instances.py)."
  type        = string
  default     = "p5.48xlarge"
}

variable "node_count" {
  description = "GPU nodes in the node group."
  type        = number
  default     = 2
}

variable "capacity_reservation_id" {
  description = "On-Demand Capacity Reservation (cr-...) the GPU nodes launch into; empty for none."
  type        = string
  default     = ""
}

variable "capacity_reservation_type" {
  description = "Type of capacity_reservation_id as EC2 reports it (ReservationType): default (On-Demand Capacity Reservation) or capacity-block (Capacity Blocks for ML: the launch template's market type and the node group's capacity type say so)."
  type        = string
  default     = "default"
  validation {
    condition     = contains(["default", "capacity-block"], var.capacity_reservation_type)
    error_message = "capacity_reservation_type: default or capacity-block."
  }
}

variable "efa_enabled" {
  description = "Attach EFA interfaces (all the instance type has) to the GPU nodes."
  type        = bool
  default     = true
}

variable "efa_interfaces" {
  description = "EFA interfaces of one instance_type node, all of which the launch template lists (eksctl's automatic EFA setup failed for p5, eksctl#7520). fsdpctl writes it into fsdpctl.auto.tfvars.json from its instance table (src/fsdpctl/instances.py); set it yourself only when running terraform without fsdpctl."
  type        = number
  default     = null
  validation {
    condition     = var.efa_interfaces != null
    error_message = "efa_interfaces is not set: run `fsdpctl cluster create --tool terraform`, which writes it for INSTANCE_TYPE, or set it to the EFA interface count of instance_type."
  }
}

variable "system_instance_type" {
  description = "Instance type of the system node group (etcd, Training Operator, monitoring)."
  type        = string
  default     = "m5.xlarge"
}

variable "system_volume_size" {
  description = "Root volume of each system node in GiB (its images, logs and Prometheus' data): eksctl's default for a managed node group, where EKS's own is 20."
  type        = number
  default     = 80
}

variable "gpu_volume_size" {
  description = "Root volume of each GPU node in GiB (container images and local data)."
  type        = number
  default     = 500
}

variable "endpoint_public_access" {
  description = "Kubernetes API endpoint reachable from outside the VPC (fsdpctl on a laptop needs it; false keeps the API private: run fsdpctl from inside the VPC)."
  type        = bool
  default     = true
}

variable "public_access_cidrs" {
  description = "CIDRs allowed to reach the public Kubernetes API endpoint (narrow it to your office or VPN egress)."
  type        = list(string)
  default     = ["0.0.0.0/0"]
}

variable "cluster_log_types" {
  description = "EKS control plane log types sent to CloudWatch Logs (billed per GB ingested)."
  type        = list(string)
  default     = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
}

variable "fsx_storage_gib" {
  description = "Shared FSx for Lustre file system in the GPU nodes' subnet, GiB (1200 or a multiple of 2400); 0: none."
  type        = number
  default     = 1200
}

variable "fsx_throughput" {
  description = "Its PERSISTENT_2 throughput, MB/s per TiB: 125, 250, 500 or 1000."
  type        = number
  default     = 250
  validation {
    condition     = contains([125, 250, 500, 1000], var.fsx_throughput)
    error_message = "fsx_throughput must be 125, 250, 500 or 1000 (PERSISTENT_2)."
  }
}
