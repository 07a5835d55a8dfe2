"""Build a tiny random-weight LLaVA (CLIP vision + Llama text) from configs, offline, for
`transformers serve` tests: a word-level tokenizer with the special tokens, a CLIP image
processor and a chat template that places the image token. Usage: make_tiny_vlm.py OUT_DIR"""

import json
import sys

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image> "
    "{% elif part['type'] == 'text' %}{{ part['text'] }} {% endif %}{% endfor %}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def main(out: str) -> None:
    words = ["<unk>", "<s>", "</s>", "<pad>", "<image>", "user:", "assistant:", "system:"]
    words += [f"w{i}" for i in range(500)] + ["describe", "this", "image", "ok", "hello", "the", "a"]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>", pad_token="<pad>",
                                        extra_special_tokens={"image_token": "<image>"})
    image_size, patch = 56, 14
    image_processor = CLIPImageProcessor(size={"shortest_edge": image_size},
                                         crop_size={"height": image_size, "width": image_size})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=patch,
                               vision_feature_select_strategy="default", chat_template=CHAT_TEMPLATE,
                               num_additional_image_tokens=1)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, image_size=image_size, patch_size=patch)
    text = LlamaConfig(vocab_size=len(words), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                       bos_token_id=1, eos_token_id=2, pad_token_id=3)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=vocab["<image>"],
                         vision_feature_select_strategy="default", vision_feature_layer=-1)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.max_new_tokens = 8
    model.save_pretrained(out)
    processor.save_pretrained(out)
    with open(f"{out}/vramdoctor_tiny_vlm.json", "w") as fh:
        json.dump({"built_by": "scripts/make_tiny_vlm.py", "vocab": len(words)}, fh)
    print(f"tiny VLM in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
