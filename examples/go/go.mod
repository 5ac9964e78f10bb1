module github.com/kalos-dev/kalos/examples/go

go 1.24

require github.com/kalos-dev/kalos/bindings/go v0.0.0

replace github.com/kalos-dev/kalos/bindings/go => ../../bindings/go
