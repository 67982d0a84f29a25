"""Engine loop, model runner, sampler and the LLM entry point."""
