# The cluster's network: a VPC made here (public subnets with a NAT gateway, private subnets for the nodes), or,
# with vpc_id, the existing VPC's private subnets as they are (their routes and NAT are the VPC owner's).
locals {
  existing_vpc       = var.vpc_id != ""
  vpc_id             = local.existing_vpc ? var.vpc_id : aws_vpc.this[0].id
  vpc_cidr           = local.existing_vpc ? data.aws_vpc.existing[0].cidr_block : var.vpc_cidr
  private_subnet_ids = local.existing_vpc ? var.private_subnet_ids : aws_subnet.private[*].id
  made_zones         = local.existing_vpc ? [] : var.availability_zones
}

data "aws_vpc" "existing" {
  count = local.existing_vpc ? 1 : 0
  id    = var.vpc_id
}

# state written before the existing-VPC option: these were single resources
moved {
  from = aws_vpc.this
  to   = aws_vpc.this[0]
}
moved {
  from = aws_internet_gateway.this
  to   = aws_internet_gateway.this[0]
}
moved {
  from = aws_eip.nat
  to   = aws_eip.nat[0]
}
moved {
  from = aws_nat_gateway.this
  to   = aws_nat_gateway.this[0]
}
moved {
  from = aws_route_table.public
  to   = aws_route_table.public[0]
}
moved {
  from = aws_route_table.private
  to   = aws_route_table.private[0]
}
moved {
  from = aws_default_security_group.this
  to   = aws_default_security_group.this[0]
}

resource "aws_vpc" "this" {
  count                = local.existing_vpc ? 0 : 1
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = { Name = var.cluster_name, "managed-by" = "fsdpctl" }
}

resource "aws_subnet" "private" {
  count             = length(local.made_zones)
  vpc_id            = aws_vpc.this[0].id
  availability_zone = local.made_zones[count.index]
  cidr_block        = cidrsubnet(var.vpc_cidr, 4, count.index)
  tags = {
    Name                                        = "${var.cluster_name}-private-${count.index}"
    "kubernetes.io/role/internal-elb"           = "1"
    "kubernetes.io/cluster/${var.cluster_name}" = "shared"
  }
}

resource "aws_subnet" "public" {
  count             = length(local.made_zones)
  vpc_id            = aws_vpc.this[0].id
  availability_zone = local.made_zones[count.index]
  cidr_block        = cidrsubnet(var.vpc_cidr, 8, 200 + count.index)
  tags = {
    Name                     = "${var.cluster_name}-public-${count.index}"
    "kubernetes.io/role/elb" = "1"
  }
}

resource "aws_internet_gateway" "this" {
  count  = local.existing_vpc ? 0 : 1
  vpc_id = aws_vpc.this[0].id
}

resource "aws_eip" "nat" {
  count  = local.existing_vpc ? 0 : 1
  domain = "vpc"
}

resource "aws_nat_gateway" "this" {
  count         = local.existing_vpc ? 0 : 1
  allocation_id = aws_eip.nat[0].id
  subnet_id     = aws_subnet.public[0].id
}

resource "aws_route_table" "public" {
  count  = local.existing_vpc ? 0 : 1
  vpc_id = aws_vpc.this[0].id
  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.this[0].id
  }
}

resource "aws_route_table" "private" {
  count  = local.existing_vpc ? 0 : 1
  vpc_id = aws_vpc.this[0].id
  route {
    cidr_block     = "0.0.0.0/0"
    nat_gateway_id = aws_nat_gateway.this[0].id
  }
}

resource "aws_route_table_association" "public" {
  count          = length(aws_subnet.public)
  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public[0].id
}

resource "aws_route_table_association" "private" {
  count          = length(aws_subnet.private)
  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private[0].id
}

# EFA needs all traffic allowed between the nodes' interfaces, to and from the same security group
resource "aws_security_group" "efa" {
  name        = "${var.cluster_name}-efa"
  description = "EFA: all traffic within the GPU nodes"
  vpc_id      = local.vpc_id
  lifecycle {
    # checked here, not in a variable's validation: one that reads another variable needs terraform 1.9
    precondition {
      condition     = local.existing_vpc == (length(var.private_subnet_ids) > 0) && length(var.private_subnet_ids) != 1
      error_message = "private_subnet_ids: two or more subnets of vpc_id, and none without vpc_id."
    }
  }
  ingress {
    description = "all from members"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    self        = true
  }
  egress {
    description = "all to members"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    self        = true
  }
}

# nothing uses the VPC's default security group: take every rule away from it (only in the VPC made here: an
# existing VPC's default group is its owner's)
resource "aws_default_security_group" "this" {
  count  = local.existing_vpc ? 0 : 1
  vpc_id = aws_vpc.this[0].id
}
