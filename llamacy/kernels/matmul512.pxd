# AVX-512 VNNI matrix products (matmul512.pyx).
#
# Nothing to cimport: a cimport would import this module (compiled for AVX-512) at the importer's import on
# every CPU. matmul.pyx imports it only where cpu.has_avx512_vnni() holds and calls fill_traits(), which
# writes its kernels into the traits table's mm_vnni column (traits.pxd's mm_try_fn).
