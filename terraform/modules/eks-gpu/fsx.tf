# The shared volume every job pod mounts (SHARED_VOLUME, bound by `fsdpctl deploy storage`): an FSx for Lustre
# file system in the GPU node group's subnet and AZ (aws-fsx-csi-driver: the file system must be in the nodes'
# AZ/subnet), reachable from the nodes on Lustre's ports. fsx_storage_gib = 0: none.
resource "aws_security_group" "lustre" {
  count       = var.fsx_storage_gib > 0 ? 1 : 0
  name        = "${var.cluster_name}-lustre"
  description = "FSx for Lustre: TCP 988 and 1018-1023 from the nodes and between the file servers"
  vpc_id      = local.vpc_id
  dynamic "ingress" {
    for_each = [[988, 988], [1018, 1023]]
    content {
      description = "Lustre ${ingress.value[0]}-${ingress.value[1]} from the nodes and the file servers"
      from_port   = ingress.value[0]
      to_port     = ingress.value[1]
      protocol    = "tcp"
      self        = true
      # the GPU nodes' interfaces carry both; the system nodes the cluster's
      security_groups = [aws_security_group.efa.id, aws_eks_cluster.this.vpc_config[0].cluster_security_group_id]
    }
  }
  egress {
    description = "Lustre replies and server-to-server traffic, within the VPC"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    cidr_blocks = [local.vpc_cidr]
  }
}

# encryption at rest under a key of the cluster's own (rotated), as the Secrets are
resource "aws_kms_key" "fsx" {
  count                   = var.fsx_storage_gib > 0 ? 1 : 0
  description             = "${var.cluster_name}: FSx for Lustre encryption at rest"
  enable_key_rotation     = true
  deletion_window_in_days = 7
  policy                  = data.aws_iam_policy_document.secrets_key.json
}

resource "aws_fsx_lustre_file_system" "shared" {
  count                       = var.fsx_storage_gib > 0 ? 1 : 0
  storage_capacity            = var.fsx_storage_gib
  subnet_ids                  = [local.private_subnet_ids[0]] # the GPU node group's subnet
  security_group_ids          = [aws_security_group.lustre[0].id]
  kms_key_id                  = aws_kms_key.fsx[0].arn
  deployment_type             = "PERSISTENT_2"
  per_unit_storage_throughput = var.fsx_throughput
  data_compression_type       = "LZ4"
  file_system_type_version    = "2.15"
  tags                        = { Name = "${var.cluster_name}-shared", "managed-by" = "fsdpctl" }
}
