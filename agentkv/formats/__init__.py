"""Model files: GGUF and safetensors readers, quant codecs, tokenizer, chat templates."""
