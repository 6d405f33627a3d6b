data "aws_iam_policy_document" "eks_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["eks.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "node_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "cluster" {
  name               = "${var.cluster_name}-cluster"
  assume_role_policy = data.aws_iam_policy_document.eks_assume.json
}

resource "aws_iam_role_policy_attachment" "cluster" {
  role       = aws_iam_role.cluster.name
  policy_arn = "arn:aws:iam::aws:policy/AmazonEKSClusterPolicy"
}

resource "aws_iam_role" "node" {
  name               = "${var.cluster_name}-node"
  assume_role_policy = data.aws_iam_policy_document.node_assume.json
}

resource "aws_iam_role_policy_attachment" "node" {
  for_each = toset([
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
  ])
  role       = aws_iam_role.node.name
  policy_arn = each.value
}

resource "aws_eks_cluster" "this" {
  name     = var.cluster_name
  version  = var.kubernetes_version
  role_arn = aws_iam_role.cluster.arn
  vpc_config {
    subnet_ids              = local.private_subnet_ids
    endpoint_private_access = true
    endpoint_public_access  = var.endpoint_public_access
    public_access_cidrs     = var.public_access_cidrs
  }
  # the HF token lives in a Kubernetes Secret: envelope-encrypt Secrets with a key of our own
  encryption_config {
    provider {
      key_arn = aws_kms_key.secrets.arn
    }
    resources = ["secrets"]
  }
  enabled_cluster_log_types = var.cluster_log_types
  depends_on                = [aws_iam_role_policy_attachment.cluster]
}

data "aws_caller_identity" "current" {}

# the account's default key policy, written out: IAM policies in this account decide who uses the key
data "aws_iam_policy_document" "secrets_key" {
  # checkov:skip=CKV_AWS_109: a key policy's "*" resource is this one key, not every resource
  # checkov:skip=CKV_AWS_111: as above: write access to this key only, for this account's IAM principals
  # checkov:skip=CKV_AWS_356: as above: "*" in a key policy means the key it is attached to
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:aws:iam::${data.aws_caller_identity.current.account_id}:root"]
    }
  }
}

resource "aws_kms_key" "secrets" {
  description             = "${var.cluster_name}: EKS Secrets envelope encryption"
  enable_key_rotation     = true
  deletion_window_in_days = 7
  policy                  = data.aws_iam_policy_document.secrets_key.json
}

# The system nodes: the Training Operator, etcd, Prometheus, Grafana, CoreDNS, the FSx controller. Their root
# volume is eksctl's default for a managed node group (80 GiB gp3: eksctl v0.230.0 DefaultNodeVolumeSize in
# pkg/apis/eksctl.io/v1alpha5/types.go), not EKS's 20 GiB (the provider's aws_eks_node_group disk_size); no pod
# with the trainer's ~20 GB image lands here (they select the GPU nodes: src/fsdpctl/render.py node_selector).
resource "aws_eks_node_group" "system" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "system"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = local.private_subnet_ids
  instance_types  = [var.system_instance_type]
  disk_size       = var.system_volume_size
  labels          = { "fsdpctl.io/role" = "system" }
  scaling_config {
    desired_size = 2
    min_size     = 1
    max_size     = 4
  }
  depends_on = [aws_iam_role_policy_attachment.node]
}

# GPU nodes close together (placement group), with every EFA interface listed: card 0 carries the primary ENA
# traffic too (device index 0), the others are EFA-only (device index 1). Not when a capacity reservation or
# Capacity Block is targeted: its instances are placed already, and a new group would only make EC2 look for
# capacity the reservation does not hold. eksctl does the same (v0.230.0 pkg/cfn/builder/
# managed_launch_template.go, makeLaunchTemplateData: a placement group only if `mng.Placement == nil &&
# mng.CapacityReservation == nil`, "A reservation should already be created with a placement group").
resource "aws_placement_group" "gpu" {
  count    = var.capacity_reservation_id == "" ? 1 : 0
  name     = "${var.cluster_name}-gpu"
  strategy = "cluster"
}

resource "aws_launch_template" "gpu" {
  name_prefix = "${var.cluster_name}-gpu-"
  user_data   = base64encode(local.gpu_user_data) # nvme.tf: instance store as RAID0
  # a Capacity Block names its instance type in the launch template, not the node group (eksctl v0.230.0
  # pkg/cfn/builder/managed_nodegroup.go: `launchTemplateData.InstanceType = instanceTypes[0]` when the
  # market type is capacity-block, InstanceTypes otherwise)
  instance_type = var.capacity_block ? var.instance_type : null
  dynamic "placement" {
    for_each = aws_placement_group.gpu
    content {
      group_name = placement.value.name
    }
  }
  metadata_options {
    http_tokens = "required"
    # 1: pods cannot reach the node's instance role through IMDS (host-network daemons still can)
    http_put_response_hop_limit = 1
  }
  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size = var.gpu_volume_size
      volume_type = "gp3"
      encrypted   = true
    }
  }
  dynamic "network_interfaces" {
    for_each = range(var.efa_interfaces)
    content {
      device_index          = network_interfaces.value == 0 ? 0 : 1
      network_card_index    = network_interfaces.value
      interface_type        = "efa"
      delete_on_termination = true
      security_groups       = [aws_security_group.efa.id, aws_eks_cluster.this.vpc_config[0].cluster_security_group_id]
    }
  }
  dynamic "capacity_reservation_specification" {
    for_each = var.capacity_reservation_id == "" ? [] : [var.capacity_reservation_id]
    content {
      capacity_reservation_target {
        capacity_reservation_id = capacity_reservation_specification.value
      }
    }
  }
  # a Capacity Block for ML launches only with this market type (and the node group's CAPACITY_BLOCK)
  dynamic "instance_market_options" {
    for_each = var.capacity_block ? ["capacity-block"] : []
    content {
      market_type = instance_market_options.value
    }
  }
}

resource "aws_eks_node_group" "gpu" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "gpu-${split(".", var.instance_type)[0]}"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = [local.private_subnet_ids[0]]
  instance_types  = var.capacity_block ? null : [var.instance_type] # a block's: in the launch template
  ami_type        = "AL2023_x86_64_NVIDIA"
  capacity_type   = var.capacity_block ? "CAPACITY_BLOCK" : "ON_DEMAND" # the reservation: in the launch template
  labels          = { "fsdpctl.io/role" = "gpu" }
  taint {
    key    = "nvidia.com/gpu"
    value  = "true"
    effect = "NO_SCHEDULE"
  }
  launch_template {
    id      = aws_launch_template.gpu.id
    version = aws_launch_template.gpu.latest_version
  }
  scaling_config {
    desired_size = var.node_count
    min_size     = 0
    max_size     = var.node_count
  }
  depends_on = [aws_iam_role_policy_attachment.node]
}
