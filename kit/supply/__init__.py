"""What a stack needs brought to its engine: images and weights in a bundle, kit's wheels,
weights pulled through a remote engine."""
