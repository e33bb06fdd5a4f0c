"""Testing aids that ship with the package: :mod:`specdec_ext.testing.simt` runs the CUDA
kernels in a CPU emulation of the SIMT model."""
