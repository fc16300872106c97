"""Developer tools: mutation_check.py (do the tests catch deliberate bugs in the engine?).

Imports nothing of the project: it copies the working tree and runs pytest there.
"""
