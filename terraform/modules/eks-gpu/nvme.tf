# Local NVMe: p4de (8 x 1 TB) and p5/p5e (8 x 3.84 TB) instance store as one RAID0 array for containerd and
# the kubelet (images, emptyDir scratch). AL2023's nodeadm does it from a NodeConfig
# (spec.instance.localStorage.strategy: RAID0); EKS merges this MIME part with the NodeConfig it writes for
# a managed node group on an EKS AMI.
locals {
  gpu_user_data = <<-EOT
    MIME-Version: 1.0
    Content-Type: multipart/mixed; boundary="//"

    --//
    Content-Type: application/node.eks.aws

    apiVersion: node.eks.aws/v1alpha1
    kind: NodeConfig
    spec:
      instance:
        localStorage:
          strategy: RAID0

    --//--
  EOT
}
