"""A host pool stand-in: the data-page methods of SGLang's ``MHATokenToKVPoolHost`` (sglang 0.5.23,
``mem_cache/pool_host/mha.py``) on a CPU buffer, mirrored because that module needs SGLang's CUDA
kernels to import. Buffer shapes and slicing are SGLang's:

    layer_first        kv_buffer [2, L, size, H, D]         page at token index i: [:, :, i:i+P]
    page_first         kv_buffer [2, size, L, H, D]         [:, i:i+P]
    page_first_direct  kv_buffer [2, pages, L, P, H, D]     [:, i//P : i//P+1]
"""

from __future__ import annotations

import torch


class HostPoolStandIn:
    def __init__(self, layout: str, layers: int, heads: int, head_dim: int, page_size: int, pages: int,
                 dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
        self.layout, self.layer_num, self.head_num, self.head_dim = layout, layers, heads, head_dim
        self.v_head_dim = head_dim
        self.page_size, self.page_num, self.size, self.dtype = page_size, pages, pages * page_size, dtype
        self.device = "cpu"
        if layout == "layer_first":
            dims: tuple[int, ...] = (2, layers, self.size, heads, head_dim)
        elif layout == "page_first":
            dims = (2, self.size, layers, heads, head_dim)
        elif layout == "page_first_direct":
            dims = (2, pages, layers, page_size, heads, head_dim)
        else:
            raise ValueError(layout)
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        P = self.page_size
        if self.layout == "layer_first":
            page = self.kv_buffer[:, :, index : index + P, :, :]
        elif self.layout == "page_first":
            page = self.kv_buffer[:, index : index + P, :, :, :]
        else:
            page = self.kv_buffer[:, index // P : index // P + 1, :, :, :, :]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(
            (2, self.layer_num, self.page_size, self.head_num, self.head_dim), dtype=self.dtype
        ).flatten()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        L, P, H, D = self.layer_num, self.page_size, self.head_num, self.head_dim
        if self.layout == "layer_first":
            self.kv_buffer[:, :, index : index + P, :, :] = data_page.reshape(2, L, P, H, D)
        elif self.layout == "page_first":
            self.kv_buffer[:, index : index + P, :, :, :] = data_page.reshape(2, P, L, H, D)
        else:
            self.kv_buffer[:, index // P : index // P + 1, :, :, :, :] = data_page.reshape(2, 1, L, P, H, D)

    def token_kv(self, index: int) -> torch.Tensor:
        """K and V of the token at ``index``: [2, L, H, D], read the way the layout defines it."""
        if self.layout == "layer_first":
            return self.kv_buffer[:, :, index]
        if self.layout == "page_first":
            return self.kv_buffer[:, index]
        return self.kv_buffer[:, index // self.page_size, :, index % self.page_size]
