"""Executor placement (``torq-gen-config``): discover / run / view / edit, per layer on NSS, CSS, HOST.
May import: torq.cluster, torq.compiled, torq.compiler, torq.program, torq.quantize, torq.graph, torq.reference, torq.runtime, torq.verify, torq.evaluate, torq.numerics, torq.errors, torq.fileio, torq.cli_util, torq._version, torq.progress, torq.workers.
"""
