"""Code that runs inside the sandboxed evaluation processes: the judge, which never runs candidate code, and the
subject, which runs the candidate on the judge's orders (see judge.py and subject.py). The processes themselves are
started and watched from outside by drkernel.runner.supervisor.

Everything under this package imports only the standard library, torch, triton, numpy and `drkernel.schema`
(itself standard library only), so that it runs on any GPU image as it is.
"""
