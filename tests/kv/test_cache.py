import pytest
import torch

from vidsight.errors import ConfigError
from vidsight.kv import TEXT, KVCache, TokenTable


def chunk(n, fill):
    return torch.full((1, 2, n, 4), float(fill)), torch.full((1, 2, n, 4), float(-fill))


def test_write_returns_views_up_to_the_chunk_and_commit_advances():
    cache = KVCache(num_layers=2, num_kv_heads=2, head_dim=4, capacity=8, dtype=torch.float32,
                    device=torch.device("cpu"))
    for layer in range(2):
        keys, values = cache.write(layer, *chunk(3, 1))
        assert keys.shape == (1, 2, 3, 4) and torch.all(values == -1)
        cache.keep(layer, 3)
    cache.commit(TokenTable.text(torch.arange(3).expand(3, -1)))
    keys, _ = cache.write(0, *chunk(2, 2))
    assert keys.shape == (1, 2, 5, 4)
    assert torch.all(keys[:, :, :3] == 1) and torch.all(keys[:, :, 3:] == 2)
    assert cache.length == 3 and len(cache.tokens) == 3
    assert cache.tokens.kind.tolist() == [TEXT] * 3
    assert cache.tokens.position[:, 0].tolist() == [0, 1, 2]


def test_writing_past_capacity_is_refused():
    cache = KVCache(1, 1, 4, capacity=2, dtype=torch.float32, device=torch.device("cpu"))
    with pytest.raises(ConfigError, match="capacity"):
        cache.write(0, torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4))


def test_token_table_slices_and_concatenates():
    a = TokenTable.text(torch.arange(4).expand(3, -1))
    b = TokenTable.text(torch.arange(10, 12).expand(3, -1))
    both = TokenTable.concat([a, b])
    assert len(both) == 6 and both.position[4, 1] == 10
    assert both[2:5].position[:, 2].tolist() == [2, 3, 10]


def test_keep_compacts_a_layers_chunk_and_maps_slots_to_tokens():
    cache = KVCache(num_layers=2, num_kv_heads=1, head_dim=2, capacity=8, dtype=torch.float32,
                    device=torch.device("cpu"))
    keys = torch.arange(10.0).reshape(1, 1, 5, 2)
    for layer, kept in [(0, None), (1, torch.tensor([1, 4]))]:
        cache.write(layer, keys, -keys)
        cache.keep(layer, 5, kept)
    cache.commit(TokenTable.text(torch.arange(5).expand(3, -1)))
    assert cache.filled == [5, 2] and cache.length == 5
    assert torch.equal(cache.keys[1, 0, 0, :2], keys[0, 0, [1, 4]])
    assert torch.equal(cache.values[1, 0, 0, :2], -keys[0, 0, [1, 4]])
    assert cache.layer_tokens(1).position[:, 0].tolist() == [1, 4]
    assert cache.layer_tokens(0).position[:, 0].tolist() == [0, 1, 2, 3, 4]
    # The next chunk lands after each layer's own kept slots.
    cache.write(1, torch.full((1, 1, 1, 2), 7.0), torch.zeros(1, 1, 1, 2))
    assert torch.all(cache.keys[1, 0, 0, 2] == 7)


def test_a_cache_grows_keeping_its_contents_and_truncates_to_a_prefix():
    from vidsight.kv import KVCache, TokenTable

    cache = KVCache(2, 1, 4, 3, torch.float32, torch.device("cpu"))
    chunks = [torch.randn(1, 1, n, 4) for n in (2, 3)]
    for chunk in chunks:
        cache.reserve(chunk.shape[2])
        for layer in range(2):
            cache.write(layer, chunk, -chunk)
            cache.keep(layer, chunk.shape[2])
        cache.commit(TokenTable.text(torch.zeros(3, chunk.shape[2], dtype=torch.long)))
    assert cache.capacity >= 5 and cache.filled == [5, 5]
    assert torch.equal(cache.keys[1, :, :, :5], torch.cat(chunks, dim=2))
    cache.truncate(2)
    assert cache.filled == [2, 2] and cache.length == 2
    with pytest.raises(Exception, match="truncate"):
        cache.truncate(3)


def test_retain_keeps_chosen_tokens_in_place_in_every_layer():
    cache = KVCache(num_layers=2, num_kv_heads=1, head_dim=2, capacity=8, dtype=torch.float32,
                    device=torch.device("cpu"))
    keys = torch.arange(12.0).reshape(1, 1, 6, 2)
    for layer, kept in [(0, None), (1, torch.tensor([1, 3, 4]))]:  # layer 1 dropped tokens 0, 2, 5
        cache.write(layer, keys, -keys)
        cache.keep(layer, 6, kept)
    cache.commit(TokenTable.text(torch.arange(6).expand(3, -1)))
    cache.retain(torch.tensor([0, 3, 4, 5]), TokenTable.text(torch.arange(20, 24).expand(3, -1)))
    assert cache.filled == [4, 2] and cache.length == 4
    assert torch.equal(cache.keys[0, 0, 0, :4], keys[0, 0, [0, 3, 4, 5]])
    assert torch.equal(cache.values[1, 0, 0, :2], -keys[0, 0, [3, 4]])
    # Each layer's slots now point at the new table's rows: layer 1 holds rows 1 and 2 (tokens 3, 4).
    assert cache.layer_tokens(1).position[:, 0].tolist() == [21, 22]
    assert cache.layer_tokens(0).position[:, 0].tolist() == [20, 21, 22, 23]
    with pytest.raises(ConfigError, match="described"):
        cache.retain(torch.tensor([0, 1]), TokenTable.text(torch.arange(3).expand(3, -1)))


def test_retain_can_transform_keys_on_the_way_with_their_new_rows():
    cache = KVCache(num_layers=2, num_kv_heads=1, head_dim=2, capacity=8, dtype=torch.float32,
                    device=torch.device("cpu"))
    keys = torch.arange(12.0).reshape(1, 1, 6, 2)
    for layer, kept in [(0, None), (1, torch.tensor([1, 3, 4]))]:
        cache.write(layer, keys, -keys)
        cache.keep(layer, 6, kept)
    cache.commit(TokenTable.text(torch.arange(6).expand(3, -1)))
    shift = torch.tensor([100.0, 200.0, 300.0, 400.0])  # one offset per row of the new table
    seen = []

    def rotate(moved, rows):
        seen.append(rows.tolist())
        return moved + shift[rows][None, None, :, None]

    cache.retain(torch.tensor([0, 3, 4, 5]), TokenTable.text(torch.arange(20, 24).expand(3, -1)), rotate)
    assert seen == [[0, 1, 2, 3], [1, 2]]
    assert torch.equal(cache.keys[0, 0, 0, :4], keys[0, 0, [0, 3, 4, 5]] + shift[:, None])
    assert torch.equal(cache.keys[1, 0, 0, :2], keys[0, 0, [3, 4]] + shift[[1, 2], None])
    assert torch.equal(cache.values[1, 0, 0, :2], -keys[0, 0, [3, 4]])  # values move unchanged
