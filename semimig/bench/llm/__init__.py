"""The LLM training program of the benchmarks: a tiny Llama (or a local Hugging Face causal LM) under
Colossal-AI's ``HybridParallelPlugin`` with :func:`semimig.enable`, run by ``benchmarks/llm_run.py``
under torchrun.

:mod:`.flags` parses and checks its command line before any process group exists; :mod:`.build`
starts the process group and builds the model and the data; :mod:`.checkpoint` saves and resumes;
:mod:`.loop` trains and evaluates; :mod:`.record` makes the summary and the ``--json`` record.
``examples/finetune_llm.py`` reuses the checks, the builders and the checkpoint of this package.
"""
