"""The UNet and what it is made of: ResBlocks, the attention stages (readable and fused), their capture and edit rule, the text encoder."""
