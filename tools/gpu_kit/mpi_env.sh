# SPDX-License-Identifier: Apache-2.0
# Sourced (bash) by the GPU kit's run.sh (as KIT/mpi/env.sh): the environment that makes the Open MPI
# 4.1 runtime carried in KIT/mpi/usr (tools/gpu_kit/assemble.py) run from there on a machine
# without MPI. Open MPI's paths are relative to its build-time prefix /usr, so OPAL_PREFIX moves
# them all, except the absolute sysconfdir (/etc/openmpi, its MCA defaults); PMIx has a prefix
# of its own.
_mpi=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)
export OPAL_PREFIX=$_mpi/usr
export OPAL_SYSCONFDIR=$_mpi/etc/openmpi
export PMIX_PREFIX=$_mpi/usr/lib/x86_64-linux-gnu/pmix2
# (the MPI processes' PMIx did not find its plugins and help texts from PMIX_PREFIX alone)
export PMIX_MCA_mca_base_component_path=$PMIX_PREFIX/lib/pmix PMIX_PKGDATADIR=$PMIX_PREFIX/share/pmix
export PATH=$_mpi/usr/bin${PATH:+:$PATH}
export LD_LIBRARY_PATH=$_mpi/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Open MPI refuses root unless told twice; the GPU machine runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One host: shared memory between the ranks (vader) and loopback; no ssh needed to start them
# (plm isolated launches local processes only). gVisor and containers refuse the single-copy
# mechanism (CMA: process_vm_readv) and may lack the cores, so copy-in/copy-out and
# --oversubscribe (run.sh) rather than binding.
export OMPI_MCA_plm=isolated
export OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
unset _mpi
