module github.com/kalos-dev/kalos/bindings/go

go 1.24
