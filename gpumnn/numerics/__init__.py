"""Pure maths the layers share: strided layouts, Winograd matrices, resize sampling tables."""
