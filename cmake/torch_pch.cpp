// Anchor TU of the shared <torch/torch.h> precompiled header.
