"""Pure maths the layers share: strided layouts, Winograd matrices, resize sampling tables, int4 packing."""
