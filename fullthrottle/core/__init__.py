"""The ground floor: the validated config, errors meant for people, the feature-naming
contract, the bundled data, and the data checks that run before any component. Imports
nothing of fullthrottle above it (docs/architecture.md)."""
