"""Adapters that put tessera's engine behind the interfaces RL frameworks train through, built on the public
`tessera` Python API only (nothing of their own in C++):

    tessera.integrations.verl      TesseraVerlEngine: verl's engine backend (verl/workers/engine/base.py, BaseEngine)
    tessera.integrations.openrlhf  TesseraStrategy: OpenRLHF's DeepSpeed strategy
                                   (openrlhf/utils/deepspeed/deepspeed.py, DeepspeedStrategy)

Import the one you need; neither framework is imported (each adapter follows its interface as documented, so a
framework's own classes are not needed to use it). Both are CPU-only, as tessera is; OpenRLHF's offload_states /
reload_states move every state to host memory and back (Engine::offload_states); parameter and NVMe offload are
refused by name (issue 25) rather than pretended.
"""
