"""Code that runs inside the sandboxed evaluation process.

Everything under this package imports only the standard library, torch, triton, numpy and `drkernel.schema`
(itself standard library only), so that it runs on any GPU image as it is.
"""
