# Local NVMe: p4de (8 x 1 TB) and p5/p5e (8 x 3.84 TB) instance store as one RAID0 array for containerd and
# the kubelet (images, emptyDir scratch). AL2023's nodeadm does it from a NodeConfig
# (spec.instance.localStorage.strategy: RAID0): its setup-local-disks mounts the array at /mnt/k8s-disks/0.
# EKS merges this MIME part with the NodeConfig it writes for a managed node group on an EKS AMI.
#
# The /local scratch job pods mount when there is no shared volume is /mnt/k8s-disks/0/local. nodeadm mounts
# the array in its run phase, after cloud-init has run this user data's script (nodeadm-run.service:
# After=cloud-final.service), so the script gives the kubelet a drop-in that makes the directory (mode 1777,
# as /tmp: non-root pods write there too) each time it starts, after the mount. Kept the same as fsdpctl's
# eksctl path (src/fsdpctl/render.py: NODE_CONFIG_RAID0, SCRATCH_SCRIPT; a test compares them).
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

    --//
    Content-Type: text/x-shellscript; charset="us-ascii"

    #!/bin/bash
    mkdir -p /etc/systemd/system/kubelet.service.d
    cat > /etc/systemd/system/kubelet.service.d/90-fsdpctl-local.conf <<'EOF'
    [Service]
    ExecStartPre=-/usr/bin/install -d -m 1777 /mnt/k8s-disks/0/local
    EOF
    systemctl daemon-reload

    --//--
  EOT
}
