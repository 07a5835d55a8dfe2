"""The directory put on PYTHONPATH to load the agent (`vramdoctor agent-path`).

It holds `sitecustomize.py` and the standard-library-only `vramdoctor_agent.py`; this file only
makes it part of the installed package.
"""
